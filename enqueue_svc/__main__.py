from enqueue_svc.app import EnqueueApp
from services.runtime.server import main

main(EnqueueApp, "enqueue")
