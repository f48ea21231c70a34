// text/unicode_data.cpp — placeholder, generated later.
