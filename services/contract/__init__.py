"""The protobuf contract on the domain side: serde translates messages to and from domain objects
(the API and the broker message body); codegen writes the Python stubs from protos/ (a buf plugin)."""
