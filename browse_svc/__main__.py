from browse_svc.app import BrowseApp
from services.runtime.server import main

main(BrowseApp, "browse")
