"""A run without a master, around Trainer.fit: process, storage, identity, checkpoint_archive,
checkpoint_decode, checkpoint_rewrite, resume, interruption, progress, local_run, checkpoint_list."""
