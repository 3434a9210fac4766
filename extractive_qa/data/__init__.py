"""SQuAD files -> windows -> batches: flat_squad, squad_files, features, feature_cache, batching."""
