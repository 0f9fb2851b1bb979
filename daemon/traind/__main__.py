from traind.cli import main

raise SystemExit(main())
