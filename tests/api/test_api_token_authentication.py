"""agenttasks.api.authentication.TokenAuthentication: DRF's token authentication with its lookup
in one raw statement, answering as DRF's does (the demo's and these tests' settings use it)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.authentication import TokenAuthentication as DRFTokenAuthentication
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import AuthenticationFailed

from agenttasks.api.authentication import TokenAuthentication

from .conftest import Api, error

# Raw SQL: its types come back otherwise on each database.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.both]


def test_a_token_authenticates_its_user_in_one_statement(alice):
    key = Token.objects.create(user=alice).key
    with CaptureQueriesContext(connection) as reads:
        user, token = TokenAuthentication().authenticate_credentials(key)
    theirs = DRFTokenAuthentication().authenticate_credentials(key)
    assert (user, token) == theirs and user.username == "alice" and token.user is user
    assert [user.password, user.is_active, token.created] == [
        theirs[0].password,
        theirs[0].is_active,
        theirs[1].created,
    ]
    assert len(reads) == 1


def test_an_unknown_or_deleted_token_fails_at_once(alice):
    token = Token.objects.create(user=alice)
    with pytest.raises(AuthenticationFailed, match="Invalid token."):
        TokenAuthentication().authenticate_credentials("not-a-token")
    assert TokenAuthentication().authenticate_credentials(token.key)[0] == alice
    token.delete()  # revoked: nothing remembers it
    with pytest.raises(AuthenticationFailed, match="Invalid token."):
        TokenAuthentication().authenticate_credentials(token.key)


def test_an_inactive_users_token_fails(alice):
    key = Token.objects.create(user=alice).key
    alice.is_active = False
    alice.save()
    with pytest.raises(AuthenticationFailed, match="User inactive or deleted."):
        TokenAuthentication().authenticate_credentials(key)


def test_through_rest_a_bad_token_is_a_401_and_a_good_one_is_the_user(alice):
    assert Api(alice, Token.objects.create(user=alice).key).get("/tasks").status_code == 200
    error(Api(alice, "not-a-token").get("/tasks"), 401, "identity_required")
