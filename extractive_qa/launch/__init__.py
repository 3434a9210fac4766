"""How a run is driven around Trainer.fit, without a master (local_run) or by one (cluster_run), with
one interface for both (driver): process, storage, interruption, progress, driver, local_run,
cluster_run, checkpoint_list."""
