from mailq.cli import main

main()
