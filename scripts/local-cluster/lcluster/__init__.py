"""A Kubernetes API server stand-in and node agents for Siphon's tests
(scripts/local-cluster.sh; docs in tests/cluster/README.md)."""
