"""auth_jwt: tokens signed in the tests, checked through a real broker."""
