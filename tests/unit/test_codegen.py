"""The buf plugin bridge (services/contract/codegen.py) writes what `--tree` writes from the same protos."""

import pathlib

from google.protobuf import descriptor_pb2, duration_pb2, timestamp_pb2
from google.protobuf.compiler import plugin_pb2

from mailqueue.v1 import mail_pb2
from services.contract import codegen


def proto_of(module) -> descriptor_pb2.FileDescriptorProto:
    out = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(out)
    return out


def test_the_plugin_answers_the_python_files_of_the_requested_protos_with_their_packages():
    mail = proto_of(mail_pb2)
    for field in mail.message_type[0].field:
        field.json_name = field.name.title()  # buf sets them; the stubs must not carry them
    request = plugin_pb2.CodeGeneratorRequest(
        file_to_generate=["mailqueue/v1/mail.proto"],
        proto_file=[proto_of(timestamp_pb2), proto_of(duration_pb2), mail],
    )
    response = codegen.plugin(request)
    assert not response.error
    files = {f.name: f.content for f in response.file}
    assert sorted(files) == ["mailqueue/__init__.py", "mailqueue/v1/__init__.py", "mailqueue/v1/mail_pb2.py",
                             "mailqueue/v1/mail_pb2.pyi", "mailqueue/v1/mail_pb2_grpc.py"]
    installed = pathlib.Path(mail_pb2.__file__).read_text()
    assert files["mailqueue/v1/mail_pb2.py"] == installed


def test_a_request_that_does_not_compile_is_an_error_not_a_crash():
    request = plugin_pb2.CodeGeneratorRequest(file_to_generate=["missing.proto"])
    assert codegen.plugin(request).error
