from parallab.cli import main

main()
