"""Rules and values of the queue, no I/O: the mail model, errors, slices, schedules and delays,
operator rules, counts, validation, retention, backoff policies, view configuration rules, names,
settings."""
