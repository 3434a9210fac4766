"""The resume guard, for the local run and the cluster path alike -- a checkpoint to continue from
read strictly, decoded into new plain values, checked against the run and written again where
only its owner can write, the one copy Determined's loaders ever read: identity, archive, decode,
rewrite, restore."""
