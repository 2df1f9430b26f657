"""Tests of spade.model."""
