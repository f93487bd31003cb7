import sys

from sentcl_cli.main import main

sys.exit(main())
