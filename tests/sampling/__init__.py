"""Tests of spade.sampling."""
