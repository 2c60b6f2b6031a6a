"""One module per subcommand: configure(parser) adds its arguments, run(args, out) does the work."""
