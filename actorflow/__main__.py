"""``python -m actorflow ...`` runs the console command ``actorflow``."""

from .cli import main

if __name__ == "__main__":
    main(prog_name="actorflow")
