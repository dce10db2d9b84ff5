"""One module per endpoint group; routes parse, call one service and return."""
