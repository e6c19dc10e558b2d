"""Assembling and running kascade's dataflows: Kafka I/O, flow assembly, workers, the CLI."""
