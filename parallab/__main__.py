from parallab.cli import app

app(prog_name="parallab")
