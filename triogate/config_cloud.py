"""Settings of the cloud providers: AWS Bedrock, Google Gemini and Vertex AI.

``litellm_params`` of a ``bedrock/``, ``gemini/`` or ``vertex_ai/`` deployment take
LiteLLM's keys (``aws_access_key_id``, ``vertex_project``, ...). What a deployment leaves
out is filled from the standard environment variables when the configuration is parsed
(:func:`fill_from_environ`), so that the environment is still read in one place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from collections.abc import Mapping

#: Provider prefixes served by the cloud providers.
CLOUD_PROVIDERS = ("bedrock", "gemini", "vertex_ai")

# litellm_params key -> environment variables that fill it, first set wins.
_ENVIRON: dict[str, dict[str, tuple[str, ...]]] = {
    "bedrock": {
        "aws_access_key_id": ("AWS_ACCESS_KEY_ID",),
        "aws_secret_access_key": ("AWS_SECRET_ACCESS_KEY",),
        "aws_session_token": ("AWS_SESSION_TOKEN",),
        "aws_region_name": ("AWS_REGION_NAME", "AWS_REGION", "AWS_DEFAULT_REGION"),
    },
    "gemini": {"api_key": ("GEMINI_API_KEY", "GOOGLE_API_KEY")},
    "vertex_ai": {
        "vertex_credentials": ("GOOGLE_APPLICATION_CREDENTIALS",),
        "vertex_project": ("VERTEXAI_PROJECT", "VERTEX_PROJECT", "GOOGLE_CLOUD_PROJECT"),
        "vertex_location": ("VERTEXAI_LOCATION", "VERTEX_LOCATION", "GOOGLE_CLOUD_LOCATION"),
    },
}


@attrs.frozen(kw_only=True)
class CloudParams:
    """A cloud deployment's credentials and placement (secrets kept out of ``repr``)."""

    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = attrs.field(default=None, repr=False)
    aws_session_token: str | None = attrs.field(default=None, repr=False)
    aws_region_name: str | None = None
    vertex_project: str | None = None
    vertex_location: str | None = None
    #: A service-account JSON document, as text or a mapping, or the path of its file.
    vertex_credentials: str | dict[str, Any] | None = attrs.field(default=None, repr=False)
    #: Where the service account's JWT is exchanged for an access token (default: the
    #: ``token_uri`` of the credentials, else Google's).
    vertex_token_url: str | None = None


def fill_from_environ(raw: Any, environ: Mapping[str, str]) -> None:
    """Fill the cloud settings a ``model_list`` entry leaves out from ``environ`` (in place)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("model_list"), list):
        return
    for entry in raw["model_list"]:
        params = entry.get("litellm_params") if isinstance(entry, dict) else None
        if not isinstance(params, dict) or not isinstance(params.get("model"), str):
            continue
        provider = params["model"].partition("/")[0]
        for key, names in _ENVIRON.get(provider, {}).items():
            if params.get(key) in (None, ""):
                value = next((environ[n] for n in names if environ.get(n)), None)
                if value is not None:
                    params[key] = value


def cloud_params(provider: str, params: Any) -> CloudParams | None:
    """The :class:`CloudParams` of a structured ``litellm_params`` (None off the cloud)."""
    if provider not in CLOUD_PROVIDERS:
        return None
    return CloudParams(**{f.name: getattr(params, f.name) for f in attrs.fields(CloudParams)})


def check_cloud_params(provider: str, cloud: CloudParams | None, path: str) -> str | None:
    """What a cloud deployment lacks, as a config error message; None when complete."""
    if provider == "bedrock" and cloud is not None:
        if not cloud.aws_region_name:
            return f"{path}.aws_region_name: bedrock/ models need a region (or AWS_REGION)"
        if not (cloud.aws_access_key_id and cloud.aws_secret_access_key):
            return (f"{path}.aws_access_key_id: bedrock/ models need aws_access_key_id and "
                    "aws_secret_access_key (or AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)")
    if provider == "vertex_ai" and cloud is not None:
        if not cloud.vertex_project:
            return f"{path}.vertex_project: vertex_ai/ models need a project"
        if not cloud.vertex_credentials:
            return (f"{path}.vertex_credentials: vertex_ai/ models need a service-account "
                    "JSON (or GOOGLE_APPLICATION_CREDENTIALS)")
    return None
