from triogate.cli import main

raise SystemExit(main())
