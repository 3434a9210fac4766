"""SQuAD files -> windows -> batches: squad_formats, squad_files, features, feature_cache, batching."""
