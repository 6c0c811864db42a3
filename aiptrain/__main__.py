from aiptrain.cli import main

main()
