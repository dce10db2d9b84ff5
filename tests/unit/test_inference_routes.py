"""The inference routes, marked where they are declared, are what the middleware labels by
path (in_flight, requests, spans); every other route by its group."""

from __future__ import annotations

from gateway.api.inference import inference_paths
from gateway.api.middleware import route_label
from gateway.app import V1_ROUTERS


def test_the_inference_routes_are_the_marked_ones() -> None:
    assert inference_paths(route for group in V1_ROUTERS for route in group.router.routes) == {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/v1/embeddings",
        "/v1/audio/speech",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
        "/v1/realtime",
    }


def test_a_request_is_labelled_by_its_route_or_its_group() -> None:
    marked = inference_paths(route for group in V1_ROUTERS for route in group.router.routes)
    assert route_label({"path": "/v1/chat/completions"}, marked) == "/v1/chat/completions"
    assert route_label({"path": "/v1/models"}, marked) == "/v1"
    assert route_label({"path": "/admin/keys"}, marked) == "/admin"
    assert route_label({"path": "/made/up/" + "x" * 50}, marked) == "other"
