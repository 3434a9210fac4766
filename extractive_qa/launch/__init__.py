"""How a run is driven around Trainer.fit, without a master (local_run) or by one (cluster_run), with
one interface for both (trial_run) and one place that picks (driver): process, storage,
interruption, progress, checkpoint_list, trial_run, local_run, cluster_run, driver."""
