"""Gateway <-> worker protobuf definitions and their generated modules."""
