"""The test harness: an emulated Determined master and cluster (det_master, det_cluster), network
namespaces as separate hosts (det_netns), reference implementations of the standard SQuAD recipe
(reference_features, reference_extraction), an all-reduce probe and the CLI's result line.
Tests and benchmarks import it as `tests.support.X`."""
