from specula.engine.cli.main import main
main(["generate","--model","bundled","--prompt","hi","--max-new-tokens","1","--strategy","none"])
