from aiptrain.launcher import main

main()
