"""The SQL that stands in for the ORM on hot paths, built once from models' _meta: a read (Read) whose rows
become instances as the ORM makes them, and a many-row insert (Insert) that writes what bulk_create would."""

# The API's busiest calls read one row and the rows it joins one to one (a token and its user; a run, its workflow
# and its lease). Compiling such a queryset costs more Python than Postgres takes to answer it
# (docs/PERFORMANCE-code.md). A Read lists every concrete column of each model from its _meta (a new field is read with
# no change here), applies the converters the ORM's compiler would (the backend's, then the field's: SQLite's datetimes,
# JSON) and builds the instances with from_db, the joined ones in the base row's relation cache exactly as
# select_related leaves them (a LEFT JOIN without a row caches None). A model read in the same row that is no relation
# of the base (`attached`: the run's last journal row) is set as an attribute of the base instance, as an annotation
# would be (None when its LEFT JOIN found no row); so is a value of `extra` SQL (the token's user's permissions), as the
# database gives it.

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import DateTimeField, JSONField, UUIDField


class Read:
    """One row of `model` and the rows it joins one to one, read by SQL text built once per database vendor.

    rows.Read(Run, "r", joined={"workflow": "w", "lock": "l"}, tail="FROM runs r JOIN ... WHERE r.id = %s")."""

    # `tail` is the SQL after the column list, with the aliases given; joined names are relations of the base
    # model that select_related accepts (a forward foreign key or one-to-one, or a reverse one-to-one); attached
    # names are attributes set on the base instance, each {name: (model, alias)}; so are extra names, each
    # {name: SQL expression} (the value as the driver gives it: no converter). deferred: {alias: field names} left
    # unread, as QuerySet.defer leaves them (read by a query of their own if ever used).

    def __init__(
        self,
        model,
        alias: str,
        *,
        tail: str,
        joined: dict[str, str] | None = None,
        attached: dict[str, tuple[Any, str]] | None = None,
        extra: dict[str, str] | None = None,
        deferred: dict[str, tuple[str, ...]] | None = None,
    ):
        self.model, self.alias, self.tail = model, alias, tail
        self.attached = list((attached or {}).items())
        self.extra = list((extra or {}).items())
        self.deferred = {name: set(names) for name, names in (deferred or {}).items()}
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
        self._built: dict[str, tuple[str, list, list]] = {}

    def _models(self):
        """(model, alias, fields read) of each instance a row holds, in column order: the base, the joined, the
        attached; the fields read are its concrete fields but the deferred ones."""
        joined = [(related, alias) for related, alias, _, _ in self.joined]
        models = [(self.model, self.alias), *joined, *(model_alias for _, model_alias in self.attached)]
        return [
            (model, alias, [f for f in model._meta.concrete_fields if f.name not in self.deferred.get(alias, ())])
            for model, alias in models
        ]

    def _build(self) -> tuple[str, list, list]:
        """The SELECT (every column read of each model, then extra), the ORM's converters by column index, and
        _models()."""
        qn = connection.ops.quote_name
        columns, converters, index = [], [], 0
        models = self._models()
        for _model, alias, fields in models:
            for field in fields:
                columns.append(f"{alias}.{qn(field.column)}")
                col = field.get_col(alias)
                for convert in connection.ops.get_db_converters(col) + col.get_db_converters(connection):
                    converters.append((index, col, convert))
                index += 1
        columns += [sql for _, sql in self.extra]
        return f"SELECT {', '.join(columns)} {self.tail}", converters, models

    def _built_now(self) -> tuple[str, list, list]:
        built = self._built.get(connection.vendor)
        if built is None:
            built = self._built[connection.vendor] = self._build()
        return built

    def width(self) -> int:
        """The columns of a row it selects."""
        return sum(len(fields) for _, _, fields in self._built_now()[2]) + len(self.extra)

    def one(self, params: list[Any]):
        """The first row `params` select, as the base instance with its joined ones cached on it; None: no row."""
        with connection.cursor() as cursor:
            cursor.execute(self._built_now()[0], params)
            row = cursor.fetchone()
        return None if row is None else self.instance(row)

    def instance(self, row):
        """A row it selected as the base instance (its joined and attached ones on it), or None when the base's
        columns are all NULL (a LEFT JOIN of this read that found no row: read_both)."""
        _, converters, models = self._built_now()
        values = list(row)
        for index, col, convert in converters:
            values[index] = convert(values[index], col, connection)
        start = 0
        instances = []
        for model, _, fields in models:
            chunk = values[start : start + len(fields)]
            start += len(fields)
            pk = model._meta.pk
            # A composite key (the journal's run_id, seq) is no column: its first part says whether a row joined.
            pk_index = fields.index(pk.fields[0] if pk not in fields else pk)
            instances.append(
                None if chunk[pk_index] is None else model.from_db(connection.alias, [f.attname for f in fields], chunk)
            )
        base = instances[0]
        if base is None:
            return None
        joined = instances[1 : 1 + len(self.joined)]
        for (_, _, local, remote), instance in zip(self.joined, joined, strict=True):
            local(base, instance)
            if remote is not None and instance is not None:
                remote(instance, base)
        for (name, _), instance in zip(self.attached, instances[1 + len(self.joined) :], strict=True):
            setattr(base, name, instance)
        for (name, _), value in zip(self.extra, values[start:], strict=True):
            setattr(base, name, value)
        return base


def read_both(first: Read, first_params: list[Any], second: Read, second_params: list[Any]) -> tuple[Any, Any]:
    """What first.one(first_params) and second.one(second_params) give, in one statement (one round trip): (None,
    None) when first selects no row; second's None when it selects none."""
    key = (connection.vendor, first, second)
    sql = _both.get(key)
    if sql is None:
        sql = _both[key] = (
            f"SELECT a.*, b.* FROM ({first._built_now()[0]}) a LEFT JOIN ({second._built_now()[0]}) b ON 1 = 1"
        )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*first_params, *second_params])
        row = cursor.fetchone()
    if row is None:
        return None, None
    split = first.width()
    return first.instance(row[:split]), second.instance(row[split:])


_both: dict[tuple, str] = {}  # read_both's statements, built once per vendor and pair of reads


class Insert:
    """model.objects.bulk_create(objs) as one INSERT built once (Postgres), the same rows: each value as the field
    prepares it, auto_now(_add) stamps set as its pre_save sets them. rows.Insert(Run).records(runs) is its one
    parameter, the same statement for any number of rows."""

    # bulk_create prepares every field of every row through the field's machinery (docs/PERFORMANCE-code.md).

    # Every row in one JSON text of records: jsonb_to_recordset gives each column its type, so the statement
    # is the same for any number of runs. A JSONField's value goes as the text its encoder writes (what Django sends
    # for it: json.dumps(value, cls=field.encoder)), cast to jsonb; a uuid as its text; a timestamp as its ISO text,
    # to the microsecond; None as null (SQL NULL, as Django sends a None).

    def __init__(self, model):
        fields: list[Any] = list(model._meta.concrete_fields)
        quote = connection.ops.quote_name
        self.stamps = [
            field for field in fields if isinstance(field, DateTimeField) and (field.auto_now or field.auto_now_add)
        ]
        self.columns: list[tuple[str, str, Any]] = []
        names, picked, types = [], [], []
        for field in fields:
            column = quote(field.column)
            if isinstance(field, JSONField):
                convert, picked_as, typed_as = _json_text(field.encoder), f"v.{column}::jsonb", "text"
            else:
                own = field.target_field if field.is_relation else field
                plain = isinstance(own, (UUIDField, DateTimeField))
                convert, picked_as, typed_as = _plain_text if plain else None, f"v.{column}", field.db_type(connection)
            self.columns.append((field.attname, field.column, convert))
            names.append(column)
            picked.append(picked_as)
            types.append(f"{column} {typed_as}")
        self.sql = (
            f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(names)}) "
            f"SELECT {', '.join(picked)} FROM jsonb_to_recordset(%s::jsonb) AS v({', '.join(types)})"
        )

    def records(self, objs: list) -> str:
        out = []
        for obj in objs:
            for field in self.stamps:
                field.pre_save(obj, add=True)  # created_at and updated_at, as bulk_create stamps them
            record = {}
            for attname, column, convert in self.columns:
                value = getattr(obj, attname)
                record[column] = value if convert is None else convert(value)
            out.append(record)
        return json.dumps(out)


def _json_text(encoder):
    return lambda value: None if value is None else json.dumps(value, cls=encoder)


def _plain_text(value):
    return None if value is None else (value.isoformat() if isinstance(value, datetime) else str(value))
