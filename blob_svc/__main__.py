from blob_svc.app import BlobApp
from services.runtime.server import main

main(BlobApp, "blob")
