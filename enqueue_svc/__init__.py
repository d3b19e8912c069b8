"""enqueue_svc: producers hand mails over; a reply means the mail is durably queued."""
