"""Routes: ``own`` (async: on the loop under ASGI), ``own_sync`` (Django runs it in a thread
under ASGI, a greenlet on gevent workers), ``health``."""

from django.urls import path

from truth_site import views

urlpatterns = [path("own", views.own), path("own_sync", views.own_sync), path("health", views.health)]
