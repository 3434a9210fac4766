"""SQuAD files -> windows -> batches: squad_files, features, feature_cache, batching."""
