from dequeue_svc.app import DequeueApp
from services.runtime.server import main

main(DequeueApp, "dequeue")
