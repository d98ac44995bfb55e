"""API tokens: who may call /api/v1. Only a SHA-256 hash of each token is stored; the token is shown once."""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone


class ApiTokenQuerySet(models.QuerySet):
    def active(self):
        """Not revoked, not expired (by the database's clock), its user active."""
        live = Q(expires_at__isnull=True) | Q(expires_at__gt=Now())
        return self.filter(live, revoked_at__isnull=True, user__is_active=True)


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True, default="", help_text="what the token is for")
    prefix = models.CharField(max_length=16, help_text="the token's first characters, to recognise it")
    token_hash = models.CharField(max_length=64, unique=True, help_text="hex SHA-256 of the whole token")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="refused from then on; empty: never expires")

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        db_table = "api_tokens"
        ordering = ["-created_at"]
        verbose_name = "API token"
        indexes = [
            # Used by the admin's list of a user's live tokens.
            models.Index(fields=["user"], name="api_tokens_live_idx", condition=Q(revoked_at__isnull=True)),
        ]

    def __str__(self):
        return f"{self.prefix}… ({self.user}{', ' + self.name if self.name else ''})"

    @property
    def is_active(self):
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > timezone.now())
