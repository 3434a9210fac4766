"""Files in and out, each through one place -- the one reader of every file, a model directory
through it, where a command may write and how: reading, model_files, files."""
