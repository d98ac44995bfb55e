"""A hot read as SQL text built once, its rows made into model instances as the ORM makes them.

The API's busiest calls read one row and the rows it joins one to one (a token and its user; a run, its workflow
and its lease). Compiling such a queryset costs more Python than Postgres takes to answer it, about a millisecond
a call (docs/PERFORMANCE.md, E). A Read lists every concrete column of each model from its _meta (a new field is
read with no change here), applies the converters the ORM's compiler would (the backend's, then the field's:
SQLite's datetimes, JSON) and builds the instances with from_db, the joined ones in the base row's relation cache
exactly as select_related leaves them (a LEFT JOIN without a row caches None).
"""

from __future__ import annotations

from typing import Any

from django.db import connection


class Read:
    """rows.Read(Run, "r", joined={"workflow": "w", "lock": "l"}, tail="FROM runs r JOIN ... WHERE r.id = %s").

    `tail` is the SQL after the column list, with the aliases given; joined names are relations of the base
    model that select_related accepts (a forward foreign key or one-to-one, or a reverse one-to-one)."""

    def __init__(self, model, alias: str, *, tail: str, joined: dict[str, str] | None = None):
        self.model, self.alias, self.tail = model, alias, tail
        self.joined = []
        for name, joined_alias in (joined or {}).items():
            field = model._meta.get_field(name)
            forward = not field.auto_created or field.concrete
            related = field.related_model
            if forward:
                local, remote = field.set_cached_value, field.remote_field.set_cached_value if field.unique else None
            else:
                local, remote = field.set_cached_value, field.field.set_cached_value
            self.joined.append((related, joined_alias, local, remote))
        self._built: dict[str, tuple[str, list]] = {}

    def _models(self):
        return [(self.model, self.alias), *((related, alias) for related, alias, _, _ in self.joined)]

    def _build(self) -> tuple[str, list]:
        qn = connection.ops.quote_name
        columns, converters, index = [], [], 0
        for model, alias in self._models():
            for field in model._meta.concrete_fields:
                columns.append(f"{alias}.{qn(field.column)}")
                col = field.get_col(alias)
                for convert in connection.ops.get_db_converters(col) + col.get_db_converters(connection):
                    converters.append((index, col, convert))
                index += 1
        return f"SELECT {', '.join(columns)} {self.tail}", converters

    def one(self, params: list[Any]):
        """The first row's base instance (its joined ones cached on it), or None."""
        built = self._built.get(connection.vendor)
        if built is None:
            built = self._built[connection.vendor] = self._build()
        sql, converters = built
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        if row is None:
            return None
        values = list(row)
        for index, col, convert in converters:
            values[index] = convert(values[index], col, connection)
        start = 0
        instances = []
        for model, _ in self._models():
            fields = model._meta.concrete_fields
            chunk = values[start : start + len(fields)]
            start += len(fields)
            pk_index = fields.index(model._meta.pk)
            instances.append(
                None if chunk[pk_index] is None else model.from_db(connection.alias, [f.attname for f in fields], chunk)
            )
        base = instances[0]
        for (_, _, local, remote), instance in zip(self.joined, instances[1:], strict=True):
            local(base, instance)
            if remote is not None and instance is not None:
                remote(instance, base)
        return base
