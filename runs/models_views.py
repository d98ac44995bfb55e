"""A run's attributes and the operators' saved views: fields, constraints and indexes; no I/O (runs.models imports
them, so Django finds them there; they name the run by string to import nothing of it)."""

from django.conf import settings
from django.db import models
from django.db.models.functions import Now

from journal.text import StorableJSONDecoder, StorableJSONEncoder


class RunAttribute(models.Model):
    """One attribute of a run (its workflow's "attributes": NAME -> template): the value with its JSON type, shown on
    the pages, and its text, which a filter compares (runs.attributes). Set when the run is created (templates that
    read only its input) or in the commit of the step it reads. created_at is the run's, so a filter's walk of the
    index is newest first, as the list is; no foreign-key constraint, as run_input_terms (runs are never deleted)."""

    pk = models.CompositePrimaryKey("run", "name")
    run = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, related_name="attributes", db_constraint=False, db_index=False
    )
    name = models.CharField(max_length=40)
    value = models.JSONField(null=True, encoder=StorableJSONEncoder, decoder=StorableJSONDecoder)
    text = models.TextField()
    created_at = models.DateTimeField()
    set_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "run_attributes"
        indexes = [
            # Used by GET /runs?attr.NAME=VALUE, the runs page and saved views: one value's runs, newest first.
            models.Index(fields=["name", "text", "created_at", "run"], name="run_attributes_filter_idx"),
            # Used by the search box (q): runs with any attribute of this text.
            models.Index(fields=["text", "created_at", "run"], name="run_attributes_text_idx"),
        ]

    def __str__(self):
        return f"{self.name}={self.text}"


class SavedView(models.Model):
    """A filter of the run list saved with a name (filter: GET /runs's query as texts, attr.NAME included), seen by
    its owner and, when shared, by the members of its group (runs.selectors.views)."""

    name = models.CharField(max_length=100)
    filter = models.JSONField(default=dict)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="saved_views")
    group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.SET_NULL, related_name="saved_views"
    )
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "saved_views"
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="saved_views_owner_name_unique")]

    def __str__(self):
        return self.name
