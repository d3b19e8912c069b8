"""The broker on RabbitMQ: topology, publisher confirms, consumers, failover across nodes."""
