"""A run without a master, around Trainer.fit: process, storage, interruption, progress,
local_run, checkpoint_list."""
