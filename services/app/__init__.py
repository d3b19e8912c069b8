"""The use-cases: enqueue, dequeue (subscriptions and verdicts), browse and admin, queues, rules, dead letters, gauges, browse start."""
