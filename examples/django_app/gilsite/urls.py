"""The Django example's routes: spans are named after these patterns ("GET io")."""

from django.urls import path

from gilsite import views

urlpatterns = [
    path("io", views.io),
    path("cpu", views.cpu),
    path("slow_c", views.slow_c),
    path("blocked", views.blocked),
    path("health", views.health),
]
