"""webhook_svc: POSTs the event stream to the operators' HTTP endpoints (services/runtime/webhooks.py)."""
