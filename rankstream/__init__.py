"""The `rankstream` command and the local development stack (Kafka + Redis without Docker)."""
