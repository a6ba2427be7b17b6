"""Process setup: `sms serve` (node/server.py), the `sms` CLI (node/cli/), the local
cluster launcher (node/launcher.py) and stage-graph commands (node/graph_commands.py).
The one package that imports every role; see tests/unit/test_layers.py."""
