from services.runtime.webhooks import main

main()
