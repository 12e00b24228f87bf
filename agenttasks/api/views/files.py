"""Stored files (docs/rest.md#files): their metadata and their bytes."""

from urllib.parse import quote

from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse
from rest_framework.response import Response

from ...models import File
from ...store import files
from ...toolkit import errors
from ...toolkit.identity import check_owner
from .. import serializers as s
from .base import ApiView, extend_schema, plain_id, refusals


def readable_file(request, file_id: str) -> File:
    """Return the file the caller may read (404 for an unknown id, 403 for another owner's file)."""
    row = None
    if plain_id(file_id):
        row = File.objects.visible().filter(pk=file_id).first()
    if row is None:
        raise errors.not_found(f"File not found: {file_id}")
    check_owner(request, row.owner_id, "file")
    return row


class FileView(ApiView):
    @extend_schema(
        operation_id="getFile",
        tags=["Files"],
        summary="Read a file's metadata",
        responses={200: s.FileEnvelopeSerializer, **refusals(403, 404)},
    )
    def get(self, request, fileId):
        return Response({"file": s.FileSerializer.present(readable_file(request, fileId))})


class FileContentView(ApiView):
    @extend_schema(
        operation_id="getFileContent",
        tags=["Files"],
        summary="Download a file's bytes",
        responses={
            (200, "*/*"): OpenApiResponse(OpenApiTypes.BINARY, description="The stored bytes"),
            **refusals(403, 404),
        },
    )
    def get(self, request, fileId):
        row = readable_file(request, fileId)
        try:
            handle = files.open_bytes(row)
        except FileNotFoundError:
            raise errors.not_found(f"File not found: {fileId}") from None
        response = FileResponse(handle, content_type=row.mime_type)
        response["Content-Length"] = str(row.size)
        response["Content-Disposition"] = content_disposition(row.name)
        response["X-Content-Type-Options"] = "nosniff"
        response["Cache-Control"] = "private"
        return response


def content_disposition(name: str) -> str:
    """`attachment` with an ASCII fallback and the RFC 5987 UTF-8 name."""
    fallback = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "_" for c in name)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"
