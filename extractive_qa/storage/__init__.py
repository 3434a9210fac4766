"""Where a checkpoint lies, read the same way from every storage: source, local_dir, buckets,
master, private_copy, where."""
