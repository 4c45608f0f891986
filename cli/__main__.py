from hrl.cli.main import main

main()
