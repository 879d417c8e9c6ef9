"""The write path: Kafka `update_rank` -> validate -> apply in Redis -> publish -> commit."""
