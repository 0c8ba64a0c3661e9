"""``python -m actorflow ...`` runs the console command ``actorflow``."""

from .cli import main

main(prog_name="actorflow")
