"""A YAML or the master's config -> a checked plan: settings, model_family, schema, experiment, run_plan."""
