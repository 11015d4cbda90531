"""One module per resource, each exposing an `APIRouter` named `router` (see `roles.api.deps`)."""
