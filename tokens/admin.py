"""Tokens in the admin: listed and revoked, never created here (manage.py pal_token shows a new token once)."""

from django.contrib import admin, messages

from . import services
from .models import ApiToken


@admin.action(description="Revoke selected tokens", permissions=["revoke"])
def revoke_tokens(modeladmin, request, queryset):
    revoked = sum(services.token_revoke(token_id=token.pk) for token in queryset)
    modeladmin.message_user(request, f"Revoked {revoked} token(s).", messages.SUCCESS)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "user", "name", "created_at", "last_used_at", "expires_at", "revoked_at", "active")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("prefix", "name", "user__username")
    list_select_related = ("user",)
    readonly_fields = ("user", "name", "prefix", "created_at", "last_used_at", "expires_at", "revoked_at")
    exclude = ("token_hash",)
    actions = [revoke_tokens]

    @admin.display(boolean=True, description="active")
    def active(self, obj):
        return obj.is_active

    def has_add_permission(self, request):
        return False  # python manage.py pal_token USERNAME

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # revoke instead: the row says who had access and when

    def has_revoke_permission(self, request):
        return request.user.is_superuser  # a token is someone's access: only a superuser takes it away
