from r3tui.cli import main

raise SystemExit(main())
